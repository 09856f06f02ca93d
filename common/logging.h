// Process-wide logging setup (glog). Call once from main() before anything logs.
#pragma once

namespace flashdraft {

// Logs go to stderr (never to files in /tmp, which fill disks on long jobs) with glog's prefix.
// `program` is argv[0]; `verbosity` sets VLOG level.
void InitLogging(const char* program, int verbosity = 0);

}  // namespace flashdraft
