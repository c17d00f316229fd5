#pragma once
// What the viewer shows, independent of ImGui: the inputs, the traces of the selected variants
// for one query row (recorded on the GPU), their float64 references, and the step cursor.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flashvk.hpp"
#include "flashvk/reference.hpp"
#include "flashvk/trace.hpp"

namespace flashvk::viewer {

struct Inputs {
  std::string name;
  HostTensor q, k, v;
  AttentionParams params;      // scale, causal, key mask, splits
  Storage storage;             // Q's, K's and V's on the device (fp32, fp16, K and V also q4_0...)
  uint32_t row = 0;            // the row a preset wants shown first
  std::vector<Variant> needs;  // variants its lesson is about: selected on load if they are not
};

/// Names of the built-in cases, "sample" first.
const std::vector<std::string>& preset_names();
/// A one-line description of a preset, for the UI.
std::string preset_description(const std::string& name);
/// Builds a preset; `assets` is the folder holding sample/{q,k,v}.npy. Throws Error if unknown.
Inputs make_preset(const std::string& name, const std::string& assets);

struct RandomSpec {
  int heads = 2, nq = 32, nk = 128, d = 16;
  float scale = 0.0f;  // 0: 1/sqrt(d)
  bool causal = true;
  int seed = 1;
};
Inputs make_random(const RandomSpec& spec);

/// The call that traces query `row` of (batch, head) alone: Q [1, 1, 1, d], K and V of its KV
/// head, and modifiers that give that row the same scores: the keys the causal limit, window
/// and chunk leave it, and its row of the additive mask, as a one-row additive mask; its key mask,
/// sink and RoPE position. A trace then costs one row, whatever Nq. None where the row cannot be
/// cut out: the user's GLSL functions (they see q_idx, FLEX_NQ, b and h) and ALiBi (relative to
/// the row's diagonal); those are traced on the whole call.
struct RowCall {
  HostTensor q, k, v;
  AttentionParams params;
};
std::optional<RowCall> row_call(const Inputs& in, uint32_t batch, uint32_t head, uint32_t row);

/// What to trace: inputs, the variants, and the row of (batch, head).
struct Request {
  Inputs inputs;
  std::vector<Variant> selected;
  uint32_t batch = 0, head = 0, row = 0;
  bool fresh = false;  ///< new inputs: the cursor starts on the row's last visible key
};

/// One variant's trace of the current row, with its float64 recurrence beside it.
struct VariantTrace {
  Variant variant;
  Trace gpu;
  reference::RowTrace ref;
  std::vector<std::vector<double>> o_norm;  // per step: the output the state stands for
  std::vector<double> error;                // per step: max |gpu state - float64 state|
};

// A float64 weight below this is at the edge of fp32 (where GPUs flush to zero) and harmless;
// a weight of 0 where the float64 one is larger is a real underflow.
inline constexpr double kUnderflowFloor = 1e-30;

enum class Jump { tile, rescale, nonfinite, underflow, error };

struct Traced;  // everything one request computes (model.cpp)

class Model {
 public:
  explicit Model(Context& ctx);
  ~Model();  ///< waits for a trace in flight

  void load(Inputs inputs);  ///< replaces the inputs and retraces, here and now
  void retrace();            ///< after a change of variant, row, head, batch or dtype

  /// The same on a worker thread: what is shown stays until the traces are done (poll()). A
  /// request made while one is in flight waits for it, replacing any other waiting one.
  void submit(Request request);
  /// What the controls show: the newest request submitted, or what is shown.
  Request wanted() const;
  /// Shows a finished request (true) and starts the waiting one; rethrows a request's Error
  /// (what was shown stays).
  bool poll();
  bool busy() const { return job_.valid() || next_.has_value(); }
  /// Drops the waiting request and waits for the one in flight, whose result (or error) is
  /// dropped too: before the device is waited on or destroyed.
  void wait();
  /// What is being traced, for a progress line: "row 5 of head 0: flash2 (2 of 3), 1.2 s";
  /// `fraction`: the share of its variants done. "" when nothing is.
  std::string progress(float* fraction = nullptr) const;
  /// Counts the requests shown (load, retrace, poll): what a panel drew from may be stale.
  uint64_t generation() const { return generation_; }

  Context& context() const { return ctx_; }
  const Inputs& inputs() const;
  const Dims& dims() const;

  std::vector<Variant> selected = {Variant::flash1, Variant::flash2, Variant::flashd};
  uint32_t batch = 0, head = 0, row = 0;
  int cursor = 0;  ///< step index: the state after key `cursor`
  double error_threshold = 1e-5;
  /// "underflow" also stops where FLASH-D as the seed writes it (fp32) loses a weight.
  bool literal_flashd_shown = false;

  const std::vector<VariantTrace>& traces() const;
  const reference::Vec& scores() const;
  /// How far storing the inputs moves the row's float64 output from the one on the inputs as
  /// given (max over components): in the current storage, and in fp16 for comparison. 0 in fp32.
  double storage_cost() const;
  double fp16_cost() const;
  /// With a softcap: the scores before it (scale * q.k, masked keys -inf); else empty.
  const reference::Vec& raw_scores() const;
  const reference::RowTrace& direct() const;
  /// float64 recurrences of FA1, FA2 and FLASH-D for the derivation panel, whatever is selected.
  const reference::RowTrace& ref_of(Variant v) const;
  /// FLASH-D as docs/algorithms.md first writes it (w from ln w of the step before), run in fp32: where it
  /// underflows, the stable form in the kernels does not.
  const reference::RowTrace& literal_flashd() const;
  int steps() const { return int(scores().size()); }
  int last_visible_key() const;  ///< where the cursor starts: the row's final state
  uint32_t tile_size() const;

  /// Next (dir = +1) or previous (-1) step with the event, or -1 if there is none.
  int find(Jump jump, int dir) const;

  /// S (scaled scores, -inf masked) and P for the current (batch, head): [Nq][Nk] row-major.
  const std::vector<double>& heat_s() const;
  const std::vector<double>& heat_p() const;

  std::string csv() const;
  std::string last_error;  ///< shown in the UI when a retrace failed

 private:
  bool event_at(Jump jump, int step) const;
  void show(std::unique_ptr<Traced> traced);  // makes it what is shown
  void start(Request request);                // on the worker

  Context& ctx_;
  std::unique_ptr<Traced> t_;
  std::future<std::unique_ptr<Traced>> job_;
  std::optional<Request> job_request_, next_;
  std::shared_ptr<std::atomic<int>> job_stage_;  // variants the job has traced so far
  std::chrono::steady_clock::time_point job_start_;
  uint64_t generation_ = 0;
};

}  // namespace flashvk::viewer
