"""Scaffolding for tests and benchmarks: spawned gloo ranks, network-namespace nodes. The package
never imports it."""
