"""jaxformer-lab: what measures and compares jaxformer (benchmarks, the XLA-vs-eager lab,
sweeps and their statistics, the GPU and TPU reports, results rendering, the Bible
corpora). It imports the library; the library never imports it. Installed, it plugs its
commands and datasets into `jaxformer` (`jaxformer_lab.plugin`)."""
