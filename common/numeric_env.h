// The numeric environment of a process: what decides the bits of its floating-point results
// beyond the job itself — the LibTorch build, the BLAS library and the kernel it chose at run time,
// and the device. Two processes whose environments are Equivalent compute the same bits from the
// same inputs; docs/determinism.md says what is pinned and what is not.
//
// Torch-free: the BLAS is asked through its exported symbols (dlsym), so this works in any process
// that loaded it; the LibTorch fields are filled by model/numeric_probe.h.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flashdraft {
namespace v1 {
class NumericEnv;
}  // namespace v1

struct NumericEnv {
  // Compared (Differences): a change here changes the bits.
  std::string torch;        // LibTorch version, "1.13.1"
  std::string torch_build;  // "cpu" or "cuda 13.0"
  std::string blas;         // library and version, "OpenBLAS 0.3.21"; "" when not OpenBLAS
  std::string blas_core;    // the kernel OpenBLAS chose at load time, "Haswell"
  std::string device;       // where it computes: "cpu", or "cuda NVIDIA H200"
  // Reported, not compared: they only say where a difference comes from. (OpenBLAS's thread
  // count does change bits: some of its products split the summed dimension by threads. Every
  // process of a job sets it to train.intra_op_threads once it has the job, PinComputeThreads in
  // model/numeric_probe.h, so it is not left to each machine's core count; a worker's Join
  // reports the count it started with.)
  int blas_threads = 0;
  std::vector<std::string> blas_env;  // the OPENBLAS_* variables seen, "NAME=value", sorted
  std::string cpu;                    // the processor's model name
  std::string gpu;                    // the model of the GPU it has ("" without one)
};

// Fills the BLAS fields of `env` from the OpenBLAS this process loaded (none found: blas and
// blas_core stay empty) and the OPENBLAS_* variables of its environment, as they are
// (ProbeNumericEnv sanitizes the whole environment).
void ProbeBlas(NumericEnv& env);
// Makes a probed environment fit what ValidateNumericEnv accepts (it travels and is recorded):
// at most 16 blas_env entries, every text cut to its limit, non-printable bytes as '?'.
void SanitizeNumericEnv(NumericEnv& env);
// The processor's model name (/proc/cpuinfo), "" where it cannot be read.
std::string CpuModelName();

// The compared fields that differ, each as "field 'mine' != 'theirs'" (empty: the same bits).
std::vector<std::string> NumericDifferences(const NumericEnv& mine, const NumericEnv& theirs);
// One line for logs: "LibTorch 1.13.1 (cpu), OpenBLAS 0.3.21 kernel Haswell, 2 BLAS thread(s),
// OPENBLAS_CORETYPE=Haswell, cpu (AMD EPYC)".
std::string DescribeNumericEnv(const NumericEnv& env);
// `key: value` lines (flashdraft-worker --probe).
std::string NumericEnvProbeLines(const NumericEnv& env);

// Labels of flashdraft_build_info: torch ("1.13.0 cpu, AVX2"), blas, blas_kernel.
std::vector<std::pair<std::string, std::string>> NumericEnvLabels(const NumericEnv& env);

nlohmann::json NumericEnvToJson(const NumericEnv& env);
// Refuses anything but an object of the fields above with strings of at most 256 printable
// characters (it comes from checkpoints and the wire); `what` names the source in the error.
absl::StatusOr<NumericEnv> NumericEnvFromJson(const nlohmann::json& json, const std::string& what);
// Checks text fields that came from the wire: at most 256 printable ASCII characters each, at
// most 16 blas_env entries.
absl::Status ValidateNumericEnv(const NumericEnv& env, const std::string& what);

// The Join's copy (Capability.numerics). From the wire: `on_gpu` says whether the job computes on
// GPUs (worker.device cuda), which makes the device "cuda <gpu>"; check with ValidateNumericEnv.
void NumericEnvToProto(const NumericEnv& env, v1::NumericEnv* out);
NumericEnv NumericEnvFromProto(const v1::NumericEnv& in, bool on_gpu);
// The device field: "cuda <gpu>" when `on_gpu`, else "cpu".
std::string ComputeDevice(const std::string& gpu, bool on_gpu);

// Whether OpenBLAS's kernel `core` is the one `kernel` names (OpenBLAS compares names without
// case).
bool SameBlasKernel(const std::string& core, const std::string& kernel);
// An OpenBLAS kernel name as train.blas_kernel and JoinReply.blas_kernel take it: 1-32 letters,
// digits and '_'.
bool ValidBlasKernelName(const std::string& kernel);
// Printable ASCII only (0x20-0x7e).
bool IsPrintableAscii(const std::string& s);

// train.blas_kernel: OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, so a process pins its
// kernel by starting again with it. Returns OK when `kernel` is empty or already the one in use;
// otherwise sets OPENBLAS_CORETYPE and execs `argv` again (/proc/self/exe), and returns only an
// error: an invalid name, no OpenBLAS, the exec failed, the process started again once already
// (FLASHDRAFT_BLAS_PINNED), or OpenBLAS was given the name and chose another kernel (a name it does
// not know, or a kernel this CPU cannot run).
absl::Status PinBlasKernel(const std::string& kernel, char** argv);

// Sets the number of threads OpenBLAS computes with (openblas_set_num_threads); returns false when
// this process's BLAS is not OpenBLAS. `threads` >= 1.
bool PinBlasThreads(int threads);

}  // namespace flashdraft
