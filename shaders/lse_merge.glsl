// The log-sum-exp merge (Flash-Decoding; docs/algorithms.md, variants, splitkv) of partial states (o_c, m_c, l_c) of one row,
// each over its own keys: m = max_c m_c, l = sum_c l_c e^(m_c - m), o = sum_c o_c e^(m_c - m) (o_c
// unnormalised; normalised partials o'_c = o_c / l_c weigh by l_c e^(m_c - m)). A part that saw no
// key has m_c = -inf and l_c = 0 and adds nothing. splitkv_merge.comp merges the key chunks with
// it, splitkv_lanes.comp a workgroup's clusters.

// e^(m_c - m) against the merged max m, 0 for a part that saw nothing (exp(-inf) spelled out).
float merge_weight(float m_c, float m) { return m_c == NEG_INF ? 0.0 : exp(m_c - m); }
