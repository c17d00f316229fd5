#!/usr/bin/env python3
"""scripts/gpu_targets.py on a made-up gpu_bench.sh run whose ratios are known: each target's
measured value is the quotient of the times written here, and its verdict follows its limit."""
import json
import os
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import gpu_targets  # noqa: E402

MATRIX = "cooperative_matrix"


def row(variant, d, ms, causal=False, layout=MATRIX, **extra):
    r = {"variant": variant, "batch": 1, "heads": 8, "kv_heads": 8, "nq": 4096, "nk": 4096,
         "d": d, "dv": d, "causal": causal, "ms": ms, "tile_layout": layout}
    r.update(extra)
    return r


def write(directory, name, doc):
    with open(os.path.join(directory, name), "w") as f:
        json.dump(doc, f)


class GpuTargets(unittest.TestCase):
    def run_on(self, files):
        with tempfile.TemporaryDirectory() as out:
            for name, doc in files.items():
                write(out, name, doc)
            return {t: (m, v) for t, m, v in gpu_targets.evaluate(out)}

    def test_each_target_from_its_times(self):
        prefill64 = {"device": "GPU", "results": [row("flash2", 64, 1.0),
                                                   row("flashd", 64, 1.04, vs_flash2=1.04)]}
        causal64 = {"device": "GPU", "results": [row("flash2", 64, 0.55, True),
                                                  row("flashd", 64, 0.66, True, vs_flash2=1.2)]}
        prefill128 = {"device": "GPU", "results": [row("flash2", 128, 2.0)]}
        sdpa = {"rows": [
            {"variant": "flash2", "causal": False, "shape": {"d": 64, "nq": 4096},
             "flashvk_ms": 1.0, "flash_ms": 0.4, "flashvk_over_flash": 2.5},
            {"variant": "flash2", "causal": False, "shape": {"d": 128, "nq": 4096},
             "flashvk_ms": 2.0, "flash_ms": 1.25, "flashvk_over_flash": 1.6}]}
        mods = {"results": [
            row("flash2", 64, 1.0, True, vs_base=1.0),
            row("flash2", 64, 1.15, True, softcap=30, vs_base=1.15),
            row("flash2", 64, 1.3, False, mask=True, mask_name="causal", vs_base=1.3),
            row("flash2", 64, 1.05, True, alibi=True, vs_base=1.05),
            row("flash2", 64, 1.2, True, score_mod="alibi.glsl", vs_base=1.2)]}
        nv2 = {"results": [row("flash2", 64, 0.8)]}
        as_built = {"results": [row("flash2", 128, 2.5)]}
        got = self.run_on({"prefill_nv2_f16_64.json": nv2, "prefill_f16_64.json": prefill64,
                           "prefill_as_built_f16_128.json": as_built,
                           "prefill_f16_64_causal.json": causal64,
                           "prefill_f16_128.json": prefill128, "sdpa.json": sdpa,
                           "modifiers_f16.json": mods})
        full = "d=%d full: flashvk <= 2x FlashAttention-2 (SDPA flash)"
        self.assertEqual(got[full % 64][1], "NOT MET")
        self.assertTrue(got[full % 64][0].startswith("2.50x"))
        self.assertEqual(got[full % 128][1], "met")
        self.assertEqual(got["d=64: causal <= 0.6x full (flash2)"], ("0.55x", "met"))
        self.assertEqual(got["d=128: causal <= 0.6x full (flash2)"], ("-", "no data"))
        self.assertEqual(got["softcap <= 1.2x causal (flash2)"], ("1.15x", "met"))
        self.assertEqual(got["causal pattern as an additive mask <= 1.1x causal (flash2)"],
                         ("1.30x", "NOT MET"))
        # 1.2 ms / 1.05 ms
        self.assertEqual(got["ALiBi as a score_mod <= 1.1x the built-in (flash2)"],
                         ("1.14x", "NOT MET"))
        self.assertEqual(got["d=64 full: flashd within 5% of flash2"], ("1.040x", "met"))
        self.assertEqual(got["d=64 causal: flashd within 5% of flash2"], ("1.200x", "NOT MET"))
        self.assertEqual(got["d=128 full: flashd within 5% of flash2"], ("-", "no data"))
        # nv2's rows are not khr's: 0.8 ms against 1.0 ms
        self.assertEqual(got["d=64 full: nv2's kernel against khr's (flash2)"],
                         ("0.80x", "nv2 wins"))
        self.assertEqual(got["d=64 causal: nv2's kernel against khr's (flash2)"],
                         ("-", "no data"))
        # the SPIR-V as built, 2.5 ms against 2.0 ms rewritten; not judged against nv2's
        self.assertEqual(got["d=128 full: the SPIR-V as built against rewritten (flash2)"],
                         ("1.25x", "rewritten wins"))
        self.assertEqual(got["d=64 full: the SPIR-V as built against rewritten (flash2)"],
                         ("-", "no data"))

    def test_other_tiles_are_not_judged_as_the_matrix_path(self):
        mods = {"results": [row("flash2", 64, 1.0, True, layout="registers", vs_base=1.0),
                            row("flash2", 64, 1.0, True, softcap=30, layout="registers",
                                vs_base=1.0)]}
        nv2 = {"results": [row("flash2", 64, 0.5, layout="registers")]}
        got = self.run_on({"modifiers_f16.json": mods, "prefill_nv2_f16_64.json": nv2,
                           "prefill_f16_64.json": {"results": [row("flash2", 64, 1.0)]}})
        self.assertEqual(got["d=64 full: nv2's kernel against khr's (flash2)"],
                         ("-", "not on the matrix path (registers, cooperative_matrix)"))
        self.assertEqual(got["softcap <= 1.2x causal (flash2)"],
                         ("1.00x", "not on the matrix path (registers)"))
        self.assertEqual(got["causal pattern as an additive mask <= 1.1x causal (flash2)"],
                         ("-", "no data"))

    def test_swept_tiles_against_the_engines_choice(self):
        # d = 128: the engine took 32 keys (2.0 ms); 64 keys run in 1.6 ms, 16 in 2.4. d = 64:
        # the engine's 64 keys are the fastest. nv2's sweep with no nv2 prefill row: no data.
        def swept(d, keys, ms):
            return {"results": [row("flash2", d, ms, block_keys=keys)]}
        files = {"prefill_f16_128.json": {"results": [row("flash2", 128, 2.0, block_keys=32)]},
                 "prefill_f16_64.json": {"results": [row("flash2", 64, 1.0, block_keys=64)]},
                 "tiles_default_128_16.json": swept(128, 16, 2.4),
                 "tiles_default_128_32.json": swept(128, 32, 2.0),
                 "tiles_default_128_64.json": swept(128, 64, 1.6),
                 "tiles_default_64_32.json": swept(64, 32, 1.1),
                 "tiles_default_64_64.json": swept(64, 64, 1.0),
                 "tiles_nv2_64_64.json": swept(64, 64, 0.5)}
        got = self.run_on(files)
        name = "d=%d full, %s API: the engine's tile against 16, 32, 64 keys (flash2)"
        self.assertEqual(got[name % (128, "default")],
                         ("16: 1.20x, 32: 1.00x, 64: 0.80x", "64 keys win (engine: 32)"))
        self.assertEqual(got[name % (64, "default")],
                         ("32: 1.10x, 64: 1.00x", "the engine's 64 keys win"))
        self.assertEqual(got[name % (64, "nv2")], ("-", "no data"))
        self.assertEqual(got[name % (128, "nv2")], ("-", "no data"))

    def test_split_row_blocks_against_the_engines_rows(self):
        # d = 128: split (32 rows) 1.5 ms against the engine's 64 rows' 2.0; d = 64: 1.2 against
        # 1.0; 128-row workgroups 0.9 ms at d = 64, none at d = 128; no d = 128 row block split
        # where the split run fell back to other tiles.
        files = {"prefill_f16_128.json": {"results": [row("flash2", 128, 2.0, block_rows=64)]},
                 "prefill_f16_64.json": {"results": [row("flash2", 64, 1.0, block_rows=64)]},
                 "rows_128_32.json": {"results": [row("flash2", 128, 1.5, block_rows=32)]},
                 "rows_64_32.json": {"results": [row("flash2", 64, 1.2, block_rows=32)]},
                 "rows_64_128.json": {"results": [row("flash2", 64, 0.9, block_rows=128)]},
                 "groups_64_128.json": {"results": [row("flash2", 64, 0.8, block_rows=128)]},
                 "groups_64_64.json": {"results": [row("flash2", 64, 1.1, block_rows=64)]}}
        name = "d=%d full: row blocks split (32 rows) against the engine's (flash2)"
        wide = "d=%d full: 128-row workgroups against the engine's (flash2)"
        got = self.run_on(files)
        self.assertEqual(got[name % 128], ("0.75x", "32 rows win"))
        self.assertEqual(got[name % 64], ("1.20x", "the engine's 64 rows win"))
        self.assertEqual(got[wide % 64], ("0.90x", "128 rows win"))
        self.assertEqual(got[wide % 128], ("-", "no data"))
        groups = "d=%d full: 32 rows a group, %d a workgroup, against the engine's (flash2)"
        self.assertEqual(got[groups % (64, 128)], ("0.80x", "32 rows a group win"))
        self.assertEqual(got[groups % (64, 64)], ("1.10x", "the engine's rows a group win"))
        self.assertEqual(got[groups % (128, 64)], ("-", "no data"))
        files["rows_128_32.json"] = {"results": [row("flash2", 128, 1.0, layout="blocks")]}
        self.assertEqual(self.run_on(files)[name % 128],
                         ("-", "not on the matrix path (blocks, cooperative_matrix)"))

    def test_skipped_phases_against_the_whole_kernel(self):
        files = {"skip_128_none.json": {"results": [row("flash2", 128, 2.0)]},
                 "skip_128_softmax.json": {"results": [row("flash2", 128, 0.5)]},
                 "skip_128_scores+pv.json": {"results": [row("flash2", 128, 1.5)]},
                 "skip_64_pv.json": {"results": [row("flash2", 64, 0.4)]}}
        got = self.run_on(files)
        name = "d=%d full: flash2 without %s (FLASHVK_MATRIX_SKIP)"
        self.assertEqual(got[name % (128, "softmax")],
                         ("0.25x (0.500 ms)", "of the whole kernel's time"))
        self.assertEqual(got[name % (128, "scores,pv")],
                         ("0.75x (1.500 ms)", "of the whole kernel's time"))
        self.assertEqual(got[name % (64, "pv")], ("-", "no data"))  # no whole run at d = 64

    def test_the_matrix_kernels_registers_and_local_memory(self):
        def pipeline(program, layout, registers, scratch, spilled=None):
            summary = {"registers": registers, "scratch_bytes": scratch}
            if spilled is not None:
                summary["spilled_registers"] = spilled
            spills = bool(scratch) or bool(spilled)  # the report's own verdict
            return {"program": program, "layout": layout, "summary": summary, "spills": spills}
        at64 = {"pipelines": [pipeline("flash2", MATRIX, 234.0, 128.0),
                              pipeline("flashd", MATRIX, 230.0, 0.0),
                              pipeline("flash2", "blocks", 253.0, 512.0)]}  # not a matrix kernel
        at128 = {"pipelines": [pipeline("flash2", MATRIX, 240.0, 0.0, 0.0),
                               pipeline("flashd", MATRIX, 250.0, 0.0, 0.0)]}
        got = self.run_on({"pipelines_f16_64.json": at64, "pipelines_f16_128.json": at128})
        name = "d=%d: the matrix kernels spill nothing, no local memory"
        self.assertEqual(got[name % 64], ("flash2: 234 regs, 128 B, flashd: 230 regs, 0 B",
                                          "NOT MET"))
        self.assertEqual(got[name % 128], ("flash2: 240 regs, 0 B, flashd: 250 regs, 0 B", "met"))
        at128["pipelines"][1] = pipeline("flashd", MATRIX, 256.0, 0.0, 4.0)  # AMD's spill
        got = self.run_on({"pipelines_f16_128.json": at128})
        self.assertEqual(got[name % 128], ("flash2: 240 regs, 0 B, flashd: 256 regs, 0 B, "
                                           "4 spilled", "NOT MET"))
        self.assertEqual(got[name % 64], ("-", "no data"))
        # A driver without statistics (no summary), or without a figure for local memory (null):
        # no data, never a zero.
        bare = {"pipelines": [{"program": "flash2", "layout": MATRIX, "spills": False}]}
        unnamed = {"pipelines": [pipeline("flash2", MATRIX, 255.0, None)]}
        got = self.run_on({"pipelines_f16_64.json": bare, "pipelines_f16_128.json": unnamed})
        self.assertEqual(got[name % 64], ("-", "no data"))
        self.assertEqual(got[name % 128], ("-", "no data"))

    def test_an_empty_run_has_no_data(self):
        got = self.run_on({})
        self.assertEqual({v for _, v in got.values()}, {"no data"})
        self.assertEqual(len(got), 30)


if __name__ == "__main__":
    unittest.main()
