#!/usr/bin/env bash
# clang's thread-safety analysis (-Wthread-safety) as errors over every translation unit of the
# project: each entry of build/compile_commands.json is compiled again by clang++ -fsyntax-only with
# its own flags, so an absl::Mutex-guarded field read or written without its lock, or a call of a
# function that needs a lock from where it is not held, fails the check (so do clang's -Wall
# -Wextra findings: the build's -Werror stays). The generated protobuf sources (build/proto) are
# skipped and their headers are system headers here, as gRPC's own are.
#
# Speed: nearly all the time goes into parsing library headers (LibTorch's ~10 s a unit, gRPC,
# protobuf, JSON, CLI11, gtest ~1-2 s). Units get them from a precompiled header, one per distinct
# set of flags, built with exactly the units' flags (clang refuses a PCH whose options differ):
# LibTorch's tensor API only for the units whose includes reach it, gtest and gmock only for test
# targets. -fpch-instantiate-templates does the headers' template instantiations once in the PCH
# instead of in every unit. A PCH is only built for flags that enough units share to pay for it.
# The PCHs build alongside the units without one; the units that use them run once all are built.
# The PCH only adds library headers ahead of the unit's own includes: the project's code is
# analysed in every unit as before. FLASHDRAFT_TSA_PCH=0: no PCH.
#
# Needs a configured build (scripts/build.sh: the compile database and the generated headers).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FLASHDRAFT_BUILD_DIR:-build}
db=$BUILD_DIR/compile_commands.json
[ -f "$db" ] && [ -d "$BUILD_DIR/proto" ] ||
  { echo "thread_safety_check: run scripts/build.sh first ($db, $BUILD_DIR/proto)"; exit 1; }
start=$(date +%s)
work=$(mktemp -d "$(realpath "$BUILD_DIR")/thread-safety.XXXXXX")  # the PCHs: ~1.2 GB
trap 'rm -rf "$work"' EXIT

# NUL-separated commands, one per line of work: $work/first (the PCHs, longest first, then the
# units without one) and $work/then (the units with one). $work/counts: units, PCHs.
python3 - "$db" "$BUILD_DIR" "$work" "${FLASHDRAFT_TSA_PCH:-1}" <<'EOF'
import collections, functools, json, os, re, shlex, sys
db, build_dir, work, use_pch = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3], sys.argv[4]
proto = os.path.join(build_dir, "proto")
source_root = os.getcwd()
# GCC's own warnings (clang would reject them as unknown under -Werror); the debug information does
# not matter for a syntax check; the old tolerance of annotations on std::mutex.
DROP = {"-Wno-error=array-bounds", "-Wno-error=stringop-overflow", "-Wno-error=stringop-overread",
        "-g", "-Wno-thread-safety-attributes"}
CHECK = ["-Wthread-safety", "-Werror=thread-safety"]
# A unit whose own includes reach one of these parses LibTorch's tensor API; any other unit is
# faster without it in its PCH (loading LibTorch costs more than c10d's Store.hpp alone).
TORCH = ("torch/torch.h", "torch/types.h", "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp",
         "torch/csrc/autograd/", "ATen/")
# What the PCHs hold: the heavy library headers the project includes widely.
LIBRARIES = ["grpcpp/grpcpp.h", "grpcpp/generic/generic_stub.h", "google/protobuf/message.h",
             "nlohmann/json.hpp", "glog/logging.h", "CLI/CLI.hpp", "absl/status/statusor.h",
             "absl/strings/str_cat.h", "absl/strings/str_format.h", "absl/synchronization/mutex.h",
             "filesystem", "fstream", "functional", "map", "memory", "random", "string", "vector"]
TESTS = ["gtest/gtest.h", "gmock/gmock.h"]  # for targets that link gtest
# A PCH costs about as much as this many units save with it.
MIN_UNITS = {True: 3, False: 4}  # with LibTorch, without
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


@functools.lru_cache(maxsize=None)
def uses_torch(path):
    with open(path, errors="replace") as f:
        names = INCLUDE.findall(f.read())
    for name in names:
        if name.startswith(TORCH):
            return True
        for root in (os.path.dirname(path), source_root, proto):
            header = os.path.realpath(os.path.join(root, name))
            if os.path.isfile(header):
                if header != path and uses_torch(header):
                    return True
                break
    return False


def clang(directory, args):
    return "cd %s && %s" % (shlex.quote(directory), shlex.join(["clang++"] + args))


units = []  # (directory, flags, source, whether it includes LibTorch)
for entry in json.load(open(db)):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    if path.startswith(proto + os.sep):
        continue
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    flags, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = a == "-o"
        elif os.path.realpath(os.path.join(entry["directory"], a)) == path:
            pass  # the source file
        elif a == "-I" + proto:
            flags += ["-isystem", proto]
        elif a not in DROP:
            flags.append(a)
    units.append((entry["directory"], tuple(flags + CHECK), path, uses_torch(path)))

groups = collections.Counter((d, f, torch) for d, f, _, torch in units)
pchs, first = {}, []
for (d, f, torch), n in groups.most_common():
    if use_pch == "0" or n < MIN_UNITS[torch]:
        continue
    base = os.path.join(work, "pch-%d" % len(pchs))
    headers = LIBRARIES + (TESTS if "-DGTEST_HAS_PTHREAD=1" in f else [])
    headers += ["torch/torch.h"] if torch else []
    with open(base + ".h", "w") as out:
        out.write("".join("#include <%s>\n" % h for h in headers))
    pchs[(d, f, torch)] = base + ".pch"
    first.append((torch, clang(d, list(f) + ["-fpch-instantiate-templates", "-x", "c++-header",
                                             base + ".h", "-o", base + ".pch"])))
first = [c for _, c in sorted(first, key=lambda t: not t[0])]  # LibTorch's (longest) first
then = []
for d, f, path, torch in units:
    pch = pchs.get((d, f, torch))
    include = ["-include-pch", pch] if pch else []
    (then if pch else first).append(clang(d, list(f) + include + ["-fsyntax-only", path]))
for name, commands in (("first", first), ("then", then)):
    with open(os.path.join(work, name), "w") as out:
        out.write("".join(c + "\0" for c in commands))
with open(os.path.join(work, "counts"), "w") as out:
    out.write("%d %d\n" % (len(units), len(pchs)))
EOF
read -r count pchs <"$work/counts"

# Every unit runs; the failures are counted at the end (xargs exits 123 when any failed).
status=0
xargs -0 -r -P "$(nproc)" -n 1 sh -c <"$work/first" || status=$?
built=$(find "$work" -name '*.pch' | wc -l)
[ "$built" -eq "$pchs" ] || { echo "thread_safety_check: building a PCH failed (above)"; exit 1; }
xargs -0 -r -P "$(nproc)" -n 1 sh -c <"$work/then" || status=$?
elapsed=$(($(date +%s) - start))
if [ "$status" -ne 0 ]; then
  echo "thread-safety analysis: findings above (${count} translation units, ${elapsed} s)"
  exit 1
fi
echo "thread-safety analysis: ${count} translation units without findings," \
  "${pchs} PCHs (${elapsed} s)"
