// `flashdraft report --job DIR [--eval EVAL.json] --out report.html`: one self-contained HTML file
// (inline SVG drawn by an inline script from the data embedded in the page; nothing fetched) with
// a job's loss and τ-estimate curves, per-position accuracy, the step's phases, the workers over
// time with the membership changes, the `flashdraft eval --json` summary when given, and the job
// configuration. Readable at 1200 px wide; every axis says its unit.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace flashdraft {

struct ReportOptions {
  std::string job_dir;  // a job's output_dir: steps.jsonl (required), job.yaml
  std::string eval;     // optional: the JSON `flashdraft eval --json` printed
  std::string out;
};

absl::Status WriteReport(const ReportOptions& options);

}  // namespace flashdraft
