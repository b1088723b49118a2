"""The harness command and its verbs: train, evaluate, join, dataset, plot, results, gpu-check."""
