// The one descriptor set of the attention kernels, a line a binding:
//   BINDING(Name, number, what it holds)
// The shaders take the numbers as B_Name constants (common.glsl, lengths.glsl, flex.cpp's
// preamble); the host as enum Binding, kName (engine/src/vk.hpp), which lays out the set from it.
// Bindings 0 to 9 are storage buffers, 10 to 12 uniform texel buffers, 13 a uniform buffer, 14 a
// storage buffer. Binding 8 holds one of three things, by build; the others one each.
#ifndef BINDING
#define BINDING(Name, number, what) const uint B_##Name = number;
#define BINDINGS_IN_GLSL
#endif
BINDING(Q, 0u, "Q, or its rotated copy (ELEM)")
BINDING(K, 1u, "K, or its rotated copy, in its storage format")
BINDING(V, 2u, "V in its storage format")
BINDING(O, 3u, "the output, fp32")
BINDING(Lse, 4u, "the log-sum-exp of each row, fp32")
BINDING(Tables, 5u, "the small tables, 32-bit words at push-constant offsets: the key mask, the additive mask's row ranges and values, the tile bitmap, the page table (common.glsl)")
BINDING(Scratch1, 6u, "splitkv's chunks' outputs; the tile pass's stamps; flex_eval's points")
BINDING(Scratch2, 7u, "splitkv's chunks' max and denominator; flex_eval's values")
BINDING(Trace, 8u, "TRACE builds: the trace records")
BINDING(TileBits, 8u, "FLEX_TILES (flex_tiles.comp): the tile bitmap it writes, the Tables buffer")
BINDING(ChunksDone, 8u, "CHUNK_MERGE (lanes): a counter of finished chunks a row block")
BINDING(Heads, 9u, "per batch and query head: the ALiBi slope and the sink logit")
BINDING(KTexels, 10u, "register tiles: K as texels")
BINDING(VTexels, 11u, "register tiles: V as texels")
BINDING(MaskTexels, 12u, "register tiles: the additive mask's values as texels")
BINDING(Lengths, 13u, "the keys attended, the append position, the tile bitmap's span (lengths.glsl)")
BINDING(FlexTable, 14u, "the user functions' flex_table[], and the word a read outside it sets")
#ifdef BINDINGS_IN_GLSL
#undef BINDING
#undef BINDINGS_IN_GLSL
#endif
