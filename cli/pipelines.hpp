#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashvk/pipelines.hpp"

namespace flashvk::cli {

/// `flashvk pipelines`: the pipelines a call builds and the driver's statistics of each.
int cmd_pipelines(const std::vector<std::string>& argv);

/// What a kernel's disassembly (ACO's "Assembly", RADV) is made of: its VALU instructions and,
/// among them, fused multiply-adds (v_fma*, v_fmac*, v_pk_fma*, v_dot2*, v_mac*) and the matrix
/// units' instructions (v_wmma*, v_swmmac*, v_mfma*, v_smfmac*), over the whole kernel and over
/// its largest loop (the key loop).
struct IsaMix {
  uint64_t valu = 0, fma = 0, matrix = 0, loop_valu = 0, loop_fma = 0, loop_matrix = 0;
};
IsaMix isa_mix(const std::string& assembly);
/// A key loop was read and has no matrix instruction: a matrix kernel on the matrix units whose
/// products went to ordinary arithmetic (`pipelines --check` fails). False where no loop was
/// read, as where the disassembler does not know the chip (LLVM 15 and RDNA3.5's gfx1150).
bool lacks_matrix_loop(const IsaMix& mix);

/// A column of the report's table (and a key of its JSON's "summary"): one quantity, which
/// each driver names its own way. `names` are the names drivers are known to give it (RADV,
/// AMD's own driver, NVIDIA's), compared without case; `words`, where no name matches, a
/// statistic whose name holds one of them (without case) and none of `unless`, provided exactly
/// one statistic does: anything less certain leaves the column empty rather than wrong.
struct StatisticColumn {
  const char* key;    ///< the JSON summary's key
  const char* title;  ///< the table's heading
  int width;
  std::vector<const char*> names, words, unless;
};
/// The report's columns, in the table's order.
const std::vector<StatisticColumn>& statistic_columns();
/// Each column's value among a pipeline's statistics (nullopt: the driver does not give it).
std::vector<std::optional<double>> column_values(const std::vector<PipelineStatistic>& stats);

}  // namespace flashvk::cli
