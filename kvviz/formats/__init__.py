"""Bit formats: what the words of every cache mean, shared by kernels, methods and references.

One module per format family: codebooks and sign generators, packing and unpacking of codes into
32-bit words, record word counts and region layouts. Nothing here runs a kernel or reproduces a
kernel's arithmetic step by step (that is the numpy references' job, kvviz/oracles/); the product
path (kernels, methods, session, UI) takes its format facts from here.

- `int8`: per-token int8 records (codes 4 a word, then the f32 scale), the seed and int8_token caches.
- `asym`: asymmetric (min/max) quantiser parameters and n-bit code packing (int4_group, KIVI).
- `fp8`: the OCP FP8 formats (E4M3FN, E5M2), their shader defines, records and decoding.
- `kivi`: KIVI's plan (which positions are quantised), key groups and buffer strides.
- `turboquant`: the SplitMix64/xoshiro256** sign generator, Walsh-Hadamard rotation, Lloyd-Max
  codebook, 2-bit/1-bit packing, f16 norm words, cache regions and the estimator that reads them.
"""
