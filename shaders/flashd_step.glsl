// FLASH-D's step (seed 000 §4), shared by flashd.comp and the cooperative-matrix kernel.
// One step of L and of the weights, from the chunk's max m and sum l (l > 0). x = t - L =
// a + ln l with a = m - L, and w = sigma(x). With u = e^-|a| (at most 1, so nothing
// overflows): for a <= 0, w = l u / (1 + l u); for a > 0, w = l / (l + u). keep = 1 - w,
// wt = w / l (each key's coefficient is its p times wt), and L + softplus(x) =
// max(L, m) + ln(denominator). Selects, not branches: llvmpipe would run both sides.
void sigma_step(float m, float l, inout float lse, out float keep, out float wt) {
  bool first = lse == NEG_INF;  // the first visible chunk: w = 1, L = t
  float a = first ? 1.0 : m - lse;
  float u = first ? 0.0 : exp(-abs(a));  // exp(-inf) spelled out as 0
  bool below = a <= 0.0;
  float y = l * u;
  float inv = 1.0 / (below ? 1.0 + y : l + u);
  keep = below ? inv : u * inv;
  wt = below ? u * inv : inv;
  float log_den = below && y < 1e-4 ? y - 0.5 * y * y : log(below ? 1.0 + y : l + u);
  lse = (below ? lse : m) + log_den;
}
