"""Distillation data and the drafters' trainers. Nothing in the engine imports this package."""
