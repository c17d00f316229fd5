#pragma once
// What the viewer shows, independent of ImGui: the inputs, the traces of the selected variants
// for one query row (recorded on the GPU), their float64 references, and the step cursor.
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

class Model {
 public:
  explicit Model(Context& ctx) : ctx_(ctx) {}

  void load(Inputs inputs);  ///< replaces the inputs and retraces
  void retrace();            ///< after a change of variant, row, head, batch or dtype

  Context& context() const { return ctx_; }
  const Inputs& inputs() const { return in_; }
  Inputs& mutable_inputs() { return in_; }
  const Dims& dims() const { return dims_; }

  std::vector<Variant> selected = {Variant::flash1, Variant::flash2, Variant::flashd};
  uint32_t batch = 0, head = 0, row = 0;
  int cursor = 0;  ///< step index: the state after key `cursor`
  double error_threshold = 1e-5;
  /// "underflow" also stops where FLASH-D as the seed writes it (fp32) loses a weight.
  bool literal_flashd_shown = false;

  const std::vector<VariantTrace>& traces() const { return traces_; }
  const reference::Vec& scores() const { return scores_; }
  /// How far storing the inputs moves the row's float64 output from the one on the inputs as
  /// given (max over components): in the current storage, and in fp16 for comparison. 0 in fp32.
  double storage_cost() const { return storage_cost_; }
  double fp16_cost() const { return fp16_cost_; }
  /// With a softcap: the scores before it (scale * q.k, masked keys -inf); else empty.
  const reference::Vec& raw_scores() const { return raw_scores_; }
  const reference::RowTrace& direct() const { return direct_; }
  /// float64 recurrences of FA1, FA2 and FLASH-D for the derivation panel, whatever is selected.
  const reference::RowTrace& ref_of(Variant v) const;
  /// FLASH-D as seed 000 writes it (w from ln w of the step before), run in fp32: where it
  /// underflows, the stable form in the kernels does not.
  const reference::RowTrace& literal_flashd() const { return literal_fd_; }
  int steps() const { return int(scores_.size()); }
  int last_visible_key() const;  ///< where the cursor starts: the row's final state
  uint32_t tile_size() const;

  /// Next (dir = +1) or previous (-1) step with the event, or -1 if there is none.
  int find(Jump jump, int dir) const;

  /// S (scaled scores, -inf masked) and P for the current (batch, head): [Nq][Nk] row-major.
  const std::vector<double>& heat_s() const { return heat_s_; }
  const std::vector<double>& heat_p() const { return heat_p_; }

  std::string csv() const;
  std::string last_error;  ///< shown in the UI when a retrace failed

 private:
  void build_heatmap();
  /// Everything the float64 reference computes from the row's scores (ref_params_).
  void reference_rows();
  bool event_at(Jump jump, int step) const;

  Context& ctx_;
  Inputs in_;
  /// in_.params with twins for the user's functions where the inputs lack them: their values on
  /// the device (flex::DeviceTwins), since the host cannot run GLSL.
  AttentionParams ref_params_;
  bool device_twins_ = false;  // ref_params_' twins are flex::DeviceTwins'
  HostTensor q_, k_, v_;       // the values the device holds (stored_values): what float64 sees
  double storage_cost_ = 0, fp16_cost_ = 0;
  Dims dims_;
  std::vector<VariantTrace> traces_;
  reference::Vec scores_, raw_scores_;
  reference::RowTrace direct_, fa1_, fa2_, fd_, literal_fd_;
  std::vector<double> heat_s_, heat_p_;
};

}  // namespace flashvk::viewer
