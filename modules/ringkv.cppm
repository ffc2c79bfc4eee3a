// ringkv — the umbrella module: `import ringkv;` brings every part of the library.
export module ringkv;
export import ringkv.trace;
export import ringkv.format;
export import ringkv.tensor;
export import ringkv.window;
export import ringkv.parallel;
export import ringkv.generator;
export import ringkv.store;
export import ringkv.kernels;
export import ringkv.attention;
export import ringkv.decode;
export import ringkv.quant;
export import ringkv.snapshot;
export import ringkv.pool;
