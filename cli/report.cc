#include "cli/report.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

// Text safe inside <script> and HTML elements.
std::string ForScript(const std::string& json) {
  return absl::StrReplaceAll(json, {{"</", "<\\/"}});
}
std::string ForHtml(const std::string& text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}});
}

constexpr char kStyle[] = R"css(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2433;
       background: #f6f7fb; margin: 0; }
header { background: #1d2433; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header .facts span { margin-right: 22px; opacity: .9; }
main { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 18px; padding: 18px 32px; }
section { background: #fff; border-radius: 8px; box-shadow: 0 1px 3px rgba(0,0,0,.08); padding: 12px 16px; }
section.wide { grid-column: 1 / -1; }
h2 { font-size: 15px; margin: 0 0 6px; }
.note { color: #5b6478; font-size: 12px; margin: 4px 0 0; }
svg.chart { width: 100%; height: auto; display: block; }
svg.chart text { font-size: 11px; fill: #5b6478; }
svg.chart .title { font-size: 12px; fill: #1d2433; }
table { border-collapse: collapse; font-size: 13px; }
td, th { padding: 3px 10px 3px 0; text-align: left; }
pre { background: #f0f2f7; padding: 10px; border-radius: 6px; overflow: auto; font-size: 12px; max-height: 360px; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
)css";

// Draws every chart from the embedded data into inline SVG.
constexpr char kScript[] = R"js(
const D = JSON.parse(document.getElementById('data').textContent);
const NS = 'http://www.w3.org/2000/svg';
const COLORS = ['#3366cc', '#dc7633', '#2e9e5b', '#a64ca6', '#c9a227', '#17a2b8', '#7f8c8d'];
function el(tag, attrs, parent, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function fmt(v) {
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < 1e4) return String(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
  if (a >= 1e3) return (v / 1e3).toFixed(a >= 1e4 ? 0 : 1) + 'k';
  if (a >= 10 || v === 0) return v.toFixed(0);
  if (a >= 1) return v.toFixed(1);
  return v.toPrecision(2);
}
function ticks(lo, hi, n) {
  const span = hi - lo || 1, raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => span / s <= n) || 10 * mag;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 * span; t += step) out.push(t);
  return out;
}
// A chart frame: axes with ticks and unit labels; returns scale functions and the plot group.
function frame(id, xs, ys, o) {
  const W = o.width || 560, H = o.height || 260, L = 58, R = 14, T = 12, B = 40;
  const svg = el('svg', {class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
                         'aria-label': o.title || id}, document.getElementById(id));
  let [x0, x1] = o.xRange || [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = o.yRange || [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  if (!o.yRange) { const pad = (y1 - y0) * 0.06; y0 = o.zero ? Math.min(0, y0) : y0 - pad; y1 += pad; }
  const X = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const Y = v => H - B - (v - y0) / (y1 - y0) * (H - T - B);
  const g = el('g', {}, svg);
  for (const t of ticks(y0, y1, 5)) {
    el('line', {x1: L, x2: W - R, y1: Y(t), y2: Y(t), stroke: '#e6e8ef'}, g);
    el('text', {x: L - 6, y: Y(t) + 4, 'text-anchor': 'end'}, g, fmt(t));
  }
  if (!o.categorical) {
    for (const t of ticks(x0, x1, 6)) {
      el('line', {x1: X(t), x2: X(t), y1: H - B, y2: H - B + 4, stroke: '#9aa1b2'}, g);
      el('text', {x: X(t), y: H - B + 16, 'text-anchor': 'middle'}, g, fmt(t));
    }
  }
  el('line', {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#9aa1b2'}, g);
  el('line', {x1: L, x2: L, y1: T, y2: H - B, stroke: '#9aa1b2'}, g);
  el('text', {x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle', class: 'title'}, g, o.xLabel);
  el('text', {x: 14, y: (T + H - B) / 2, 'text-anchor': 'middle', class: 'title',
              transform: `rotate(-90 14 ${(T + H - B) / 2})`}, g, o.yLabel);
  return {svg, g, X, Y, L, R, T, B, W, H};
}
function line(f, xs, ys, color, width) {
  const d = xs.map((x, i) => (i ? 'L' : 'M') + f.X(x).toFixed(1) + ' ' + f.Y(ys[i]).toFixed(1)).join('');
  return el('path', {d, fill: 'none', stroke: color, 'stroke-width': width || 1.6}, f.g);
}
function legend(f, names, colors) {
  let x = f.L + 10;
  names.forEach((n, i) => {
    el('rect', {x, y: f.T + 2, width: 10, height: 10, fill: colors[i]}, f.g);
    el('text', {x: x + 14, y: f.T + 11}, f.g, n);
    x += 26 + 6.2 * n.length;
  });
}
// Mean over windows of ~n points, for curves of thousands of steps.
function smooth(xs, ys, n) {
  const w = Math.max(1, Math.round(xs.length / n)), ox = [], oy = [];
  for (let i = 0; i < xs.length; i += w) {
    const a = ys.slice(i, i + w).filter(v => Number.isFinite(v));
    if (!a.length) continue;
    ox.push(xs[Math.min(i + w - 1, xs.length - 1)]);
    oy.push(a.reduce((s, v) => s + v, 0) / a.length);
  }
  return [ox, oy];
}
function bars(id, labels, values, o) {
  const f = frame(id, [0, labels.length], values, Object.assign({categorical: true, zero: true}, o));
  const bw = (f.X(1) - f.X(0)) * 0.7;
  labels.forEach((lab, i) => {
    const x = f.X(i + 0.5) - bw / 2, y = f.Y(values[i]);
    el('rect', {x, y, width: bw, height: Math.max(0, f.Y(o.yRange ? o.yRange[0] : 0) - y),
                fill: o.color || COLORS[0], class: 'bar'}, f.g);
    el('text', {x: f.X(i + 0.5), y: f.H - f.B + 16, 'text-anchor': 'middle'}, f.g, lab);
    el('text', {x: f.X(i + 0.5), y: y - 4, 'text-anchor': 'middle'}, f.g, fmt(values[i]));
  });
  return f;
}

const steps = D.steps.map(r => r.step + 1);
if (steps.length) {
  const loss = D.steps.map(r => r.loss);
  // train.loss kl / mix: the distillation term beside the cross-entropy.
  const kl = D.steps.some(r => r.kl !== undefined) ? D.steps.map(r => r.kl || 0) : null;
  const f = frame('loss', steps, kl ? loss.concat(kl) : loss,
                  {xLabel: 'step', yLabel: kl ? 'loss (weighted, nats)' : 'loss (weighted CE, nats)'});
  line(f, steps, loss, '#c5cbe0', 1);
  const [sx, sy] = smooth(steps, loss, 120);
  line(f, sx, sy, COLORS[0], 2);
  if (kl) {
    const [kx, ky] = smooth(steps, kl, 120);
    line(f, kx, ky, COLORS[2], 2);
    legend(f, ['CE', 'KL(target || drafter)'], [COLORS[0], COLORS[2]]);
  }
  const tau = D.steps.map(r => r.tau_estimate);
  const evals = D.evals.filter(e => e.tau > 0);
  const tf = frame('tau', steps, tau.concat(evals.map(e => e.tau)),
                   {xLabel: 'step', yLabel: 'tokens per verify cycle'});
  line(tf, steps, tau, '#e5c8b3', 1);
  const [tx, ty] = smooth(steps, tau, 120);
  line(tf, tx, ty, COLORS[1], 2);
  for (const e of evals) el('circle', {cx: tf.X(e.completed_steps), cy: tf.Y(e.tau), r: 4, fill: COLORS[2]}, tf.g);
  legend(tf, ['τ estimate', 'eval τ'].slice(0, evals.length ? 2 : 1), [COLORS[1], COLORS[2]]);

  // The learning rate the coordinator sent with every step (train.lr_schedule).
  const lr = D.steps.map(r => r.learning_rate || 0);
  const lf = frame('lr', steps, lr.concat([0]), {xLabel: 'step', yLabel: 'learning rate', zero: true});
  line(lf, steps, lr, COLORS[3], 2);

  // Accuracy by block position over the last tenth of the steps.
  const tail = D.steps.slice(-Math.max(1, Math.floor(D.steps.length / 10)));
  const k = tail[0].slot_accuracy.length;
  const acc = [...Array(k).keys()].map(i => tail.reduce((s, r) => s + r.slot_accuracy[i], 0) / tail.length);
  bars('accuracy', acc.map((_, i) => String(i + 1)), acc,
       {xLabel: 'block position (drafted token k)', yLabel: 'top-1 accuracy', yRange: [0, 1]});

  // The step's phases (mean over workers), stacked, against the wall time of the step.
  const phases = ['wait', 'forward', 'backward', 'allreduce', 'optimizer'];
  const series = phases.map(p => smooth(steps, D.steps.map(r => 1e3 * (r.timings[p] || 0)), 80));
  const wall = smooth(steps, D.steps.map(r => 1e3 * r.step_seconds), 80);
  const xs = series[0][0], stacked = xs.map((_, i) => series.reduce((s, ser) => s + ser[1][i], 0));
  const pf = frame('phases', xs, stacked.concat(wall[1]), {xLabel: 'step', yLabel: 'milliseconds per step', zero: true});
  let below = xs.map(() => 0);
  series.forEach((ser, j) => {
    const top = below.map((b, i) => b + ser[1][i]);
    const d = xs.map((x, i) => (i ? 'L' : 'M') + pf.X(x).toFixed(1) + ' ' + pf.Y(top[i]).toFixed(1)).join('') +
              xs.slice().reverse().map((x, i) => 'L' + pf.X(x).toFixed(1) + ' ' + pf.Y(below[xs.length - 1 - i]).toFixed(1)).join('') + 'Z';
    el('path', {d, fill: COLORS[j], opacity: 0.75, class: 'area'}, pf.g);
    below = top;
  });
  line(pf, wall[0], wall[1], '#1d2433', 1.4);
  legend(pf, phases.concat(['whole step']), COLORS.slice(0, phases.length).concat(['#1d2433']));

  // Workers: the world size of every step, membership changes marked.
  const world = D.steps.map(r => r.world_size || 0);
  const wf = frame('workers', steps, world.concat([0]),
                   {xLabel: 'step', yLabel: 'workers training', zero: true, width: 1120, height: 220});
  line(wf, steps, world, COLORS[2], 2);
  for (const m of D.membership) {
    const x = wf.X(Math.max(steps[0], m.next_step + 1));
    el('line', {x1: x, x2: x, y1: wf.T, y2: wf.H - wf.B, stroke: '#c62828', 'stroke-dasharray': '3 3'}, wf.g);
  }
}

if (D.eval) {
  const e = D.eval;
  bars('eval-acceptance', e.acceptance_per_position.map((_, i) => String(i + 1)), e.acceptance_per_position,
       {xLabel: 'block position k', yLabel: 'cycles accepting draft k', yRange: [0, 1], color: COLORS[2]});
  bars('eval-histogram', e.accepted_length_histogram.map((_, i) => String(i + 1)), e.accepted_length_histogram,
       {xLabel: 'tokens accepted in a cycle', yLabel: 'verify cycles', color: COLORS[3]});
}
)js";

// The records of a job's steps.jsonl, by kind.
struct JobLog {
  nlohmann::json steps = nlohmann::json::array();
  nlohmann::json membership = nlohmann::json::array();
  nlohmann::json evals = nlohmann::json::array();
};

absl::StatusOr<JobLog> ReadJobLog(const std::string& steps_path) {
  std::ifstream in(steps_path);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat(steps_path, ": cannot open (--job is a job's output_dir)"));
  JobLog log;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (!r.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(steps_path, ":", line_no, ": not JSON"));
    }
    const std::string event = r.value("event", "");
    if (event == "membership") {
      log.membership.push_back(r);
    } else if (event == "eval") {
      log.evals.push_back(r);
    } else if (event.empty() && r.contains("step") && r.contains("loss") &&
               r.contains("slot_accuracy") && r.contains("timings")) {
      log.steps.push_back(r);
    }
  }
  if (log.steps.empty()) return absl::InvalidArgumentError(absl::StrCat(steps_path, ": no steps"));
  return log;
}

// --eval: the JSON of `flashdraft eval --json`; null without it.
absl::StatusOr<nlohmann::json> ReadEval(const std::string& path) {
  if (path.empty()) return nlohmann::json();
  FD_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  nlohmann::json eval = nlohmann::json::parse(text, nullptr, false);
  if (!eval.is_object() || !eval.contains("acceptance_per_position") ||
      !eval.contains("accepted_length_histogram")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not the JSON of `flashdraft eval --json`"));
  }
  return eval;
}

// The page's head and its header: the job's name and its figures at a glance.
void WriteHeader(std::ostringstream& html, const std::string& name, const nlohmann::json& steps,
                 const nlohmann::json& eval) {
  const nlohmann::json& last = steps.back();
  double seconds = 0;
  for (const auto& s : steps) seconds += s.value("step_seconds", 0.0);
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
       << ForHtml(name) << " — flashdraft report</title>\n<style>" << kStyle << "</style></head>\n"
       << "<body><header><h1>" << ForHtml(name) << "</h1><div class=\"facts\">"
       << "<span>" << steps.size() << " steps</span>"
       << absl::StrCat("<span>final loss ", absl::StrFormat("%.3f", last["loss"].get<double>()),
                       "</span><span>τ estimate ",
                       absl::StrFormat("%.2f", last["tau_estimate"].get<double>()),
                       "</span><span>training time ", absl::StrFormat("%.0f s", seconds),
                       "</span><span>workers ", last.value("world_size", 0), "</span>");
  if (eval.is_object()) {
    html << absl::StrFormat("<span>eval τ %.2f, speedup %.2f×, ", eval.value("tau", 0.0),
                            eval.value("speedup", 0.0))
         << (eval.value("lossless", false) ? "lossless" : "NOT lossless") << "</span>";
  }
  html << "</div></header>\n";
}

// The chart sections the script fills in.
void WriteChartSections(std::ostringstream& html) {
  html << "<section><h2>Loss</h2><div id=\"loss\"></div><p class=\"note\">Every step (light) "
          "and its moving mean.</p></section>\n"
       << "<section><h2>Acceptance length τ</h2><div id=\"tau\"></div><p class=\"note\">The "
          "estimate from slot accuracies (1 + Σ_k Π_{i≤k} acc_i); dots, when the job "
          "evaluated during training: τ measured by speculative decoding.</p></section>\n"
       << "<section><h2>Learning rate</h2><div id=\"lr\"></div><p class=\"note\">As each "
          "step applied it (train.lr_schedule).</p></section>\n"
       << "<section><h2>Accuracy by block position</h2><div id=\"accuracy\"></div><p "
          "class=\"note\">Mean over the last tenth of the steps.</p></section>\n"
       << "<section><h2>Where a step's time goes</h2><div id=\"phases\"></div><p "
          "class=\"note\">Mean over workers, stacked; the line is the whole step at the "
          "coordinator.</p></section>\n";
}

// The workers chart and a table of the membership changes.
void WriteWorkersSection(std::ostringstream& html, const nlohmann::json& membership) {
  html << "<section class=\"wide\"><h2>Workers</h2><div id=\"workers\"></div><p "
          "class=\"note\">Dashed: a membership change (a worker joined, left or was "
          "lost).</p><table><tr><th>step</th><th>epoch</th><th>workers</th><th>changes</th></tr>";
  for (const auto& m : membership) {
    std::string changes;
    for (const auto& c : m.value("changes", nlohmann::json::array())) {
      absl::StrAppend(&changes, changes.empty() ? "" : "; ",
                      c.is_string() ? c.get<std::string>() : c.dump());
    }
    std::string workers;
    for (const auto& w : m.value("workers", nlohmann::json::array())) {
      absl::StrAppend(&workers, workers.empty() ? "" : ", ", w.get<std::string>());
    }
    html << "<tr><td>" << m.value("next_step", 0) << "</td><td>" << m.value("membership_epoch", 0)
         << "</td><td>" << ForHtml(workers) << "</td><td>"
         << ForHtml(changes.empty() ? "—" : changes) << "</td></tr>";
  }
  html << "</table></section>\n";
}

// `eval` is not const: a missing section reads as null, as it always did.
void WriteEvalSection(std::ostringstream& html, nlohmann::json& eval) {
  const auto& t = eval["target_only"];
  const auto& s = eval["speculative"];
  html << "<section class=\"wide\"><h2>Evaluation (flashdraft eval)</h2><table>"
       << absl::StrFormat(
              "<tr><td>prompts</td><td>%d</td></tr><tr><td>block size</td><td>%d</td></tr>"
              "<tr><td>τ (mean accepted tokens per verify cycle)</td><td>%.2f</td></tr>"
              "<tr><td>target only</td><td>%.1f tokens/s</td></tr>"
              "<tr><td>speculative</td><td>%.1f tokens/s (%.2f×)</td></tr>",
              eval.value("prompts", 0), eval.value("block_size", 0), eval.value("tau", 0.0),
              t.value("tokens_per_second", 0.0), s.value("tokens_per_second", 0.0),
              eval.value("speedup", 0.0))
       << "<tr><td>lossless check</td><td>"
       << (eval.value("lossless", false)
               ? "<span class=\"ok\">every output equals the target's greedy decoding</span>"
               : "<span class=\"bad\">FAILED</span>")
       << "</td></tr></table><main style=\"padding:0\"><div id=\"eval-acceptance\"></div>"
       << "<div id=\"eval-histogram\"></div></main></section>\n";
}

}  // namespace

absl::Status WriteReport(const ReportOptions& o) {
  FD_ASSIGN_OR_RETURN(const JobLog log, ReadJobLog(o.job_dir + "/steps.jsonl"));
  nlohmann::json data = {
      {"steps", log.steps}, {"membership", log.membership}, {"evals", log.evals}};
  FD_ASSIGN_OR_RETURN(nlohmann::json eval, ReadEval(o.eval));
  if (eval.is_object()) data["eval"] = eval;
  const std::string job_yaml = ReadFile(o.job_dir + "/job.yaml").value_or("(no job.yaml)");
  std::string name = "flashdraft job";
  for (absl::string_view l : absl::StrSplit(job_yaml, '\n')) {
    if (absl::StartsWith(l, "name: ")) name = std::string(l.substr(6));
  }

  std::ostringstream html;
  WriteHeader(html, name, log.steps, eval);
  html << "<main>\n";
  WriteChartSections(html);
  WriteWorkersSection(html, log.membership);
  if (eval.is_object()) WriteEvalSection(html, eval);
  html << "<section class=\"wide\"><h2>Job</h2><pre>" << ForHtml(job_yaml) << "</pre></section>\n"
       << "</main>\n<script id=\"data\" type=\"application/json\">" << ForScript(data.dump())
       << "</script>\n<script>" << kScript << "</script>\n</body></html>\n";
  return WriteFileAtomically(o.out, html.str());
}

}  // namespace flashdraft
