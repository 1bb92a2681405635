"""Questions and passages: the synthetic world, the benchmark file formats, the hub, and assembling a dataset."""
