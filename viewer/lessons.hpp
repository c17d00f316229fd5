#pragma once
// What each preset teaches: a few sentences and the steps worth seeing, found in the current
// trace (not fixed step numbers), each with what to look at there.
#include <string>
#include <vector>

#include "model.hpp"

namespace flashvk::viewer {

struct PointOfInterest {
  int step = 0;       ///< the cursor position it goes to: the state after key `step`
  std::string title;  ///< a few words, for the button row and the summary
  std::string look;   ///< what to look at there, in a sentence or two
  /// The weight to see is far below a linear axis (e.g. 1e-27 beside 0): arriving there puts
  /// the weight plot on a log scale.
  bool log_weights = false;
};

struct Lesson {
  std::string intro;                    ///< what the preset is about and how to walk it
  std::vector<PointOfInterest> points;  ///< in step order
  /// The preset is about FLASH-D's literal form: draw it beside the stable one.
  bool literal_flashd = false;
};

/// The lesson of the model's inputs (by preset name; random and file inputs get a general
/// walk through the row) for the current batch, head and row.
Lesson lesson_for(const Model& model);

/// First visible step where the seed's literal FLASH-D (fp32) has w = 0 (from then on
/// ln w = -inf), or -1.
int literal_flashd_zero(const Model& model);
/// First step where that literal w is 0 while the float64 weight is above 1e-30: where the
/// failure shows, or -1.
int literal_flashd_underflow(const Model& model);

}  // namespace flashvk::viewer
