// The worker process (docs/ARCHITECTURE.md): joins the coordinator, forms the Gloo group through
// the coordinator's store, fetches the frozen target tensors, then trains on one thread: for each
// of its shards of a step forward + backward, then the gradient reduction, ack, wait for the
// commit, optimizer step. gRPC threads only move bytes into a queue.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/security.h"
#include "worker/leave_request.h"

namespace flashdraft {

struct JobConfig;

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:7600";
  std::string worker_id;
  // The first join waits this long for the coordinator.
  double connect_timeout_seconds = 60;
  // After losing the coordinator (or being dropped from the job), join again for this long.
  double reconnect_timeout_seconds = 120;
  // FetchTensors (the target's tensors, the weights) must end within this long.
  double fetch_timeout_seconds = 600;
  // TLS and the job secret (empty: plaintext, no token; for a coordinator on this host).
  ClientSecurity security;
  // Where this worker serves /metrics (host:port, port 0 picks one); empty: the job's
  // metrics.worker_listen. "off": none.
  std::string metrics_listen;
  // Where the bound metrics port is written once serving (launch: <out>/metrics/worker-<i>.port).
  std::string metrics_port_file;
  // worker.device: cuda — the GPU ordinal; -1: the local rank's (LOCAL_RANK / SLURM_LOCALID among
  // the visible GPUs; the only one when CUDA_VISIBLE_DEVICES names one).
  int cuda_device = -1;
  // Refused because its OpenBLAS kernel is not the one the job pins (train.blas_kernel): starts
  // the process again with it (PinBlasKernel); returns only an error. Unset: the refusal stands.
  std::function<absl::Status(const std::string& kernel)> pin_blas_kernel;
  // Set by main's SIGTERM handler: leave the job at the next step boundary (the coordinator
  // re-forms the group without this worker; not a failure), or stop trying to join. Null: never.
  const LeaveRequest* leave = nullptr;
  // Called with each session's job once it is known, before the session forms any group: the
  // process-wide settings the job implies (main sets NCCL's environment). Unset: none.
  std::function<void(const JobConfig& job)> configure_process;
};

// How a worker's part in a job ended.
enum class WorkerEnd {
  kJobFinished,  // the job trained all its steps
  kJobStopped,   // the coordinator stopped the job before its end (SIGTERM to it; resumable)
  kLeft,         // this worker left (SIGTERM to it) or was let go before the job's end
};

// Trains until the job ends, this worker leaves, or a fatal error (returned).
absl::StatusOr<WorkerEnd> RunWorker(const WorkerOptions& options);

// What this binary can run, one "key: value" per line: backends (gloo[,nccl]), torch_cuda
// (yes|no: LibTorch has CUDA), cuda_devices (visible to the CUDA runtime) and cuda (why none),
// then its numeric environment (torch, blas, blas_core, blas_threads, blas_env, cpu, gpu).
std::string ProbeWorker();

}  // namespace flashdraft
