"""Measurements behind the app's Lab: what a forward costs on the loaded model and device, and what
batching buys. Each measurement is a generator of frozen events (one per point), so the app can draw a
progress bar and the engine thread can take turns between points; the arithmetic they are compared with
is in decoding.core.roofline and decoding.core.formulas."""
