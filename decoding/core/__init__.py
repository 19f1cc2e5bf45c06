"""The trace contract, configs, errors, logit processors, acceptance rules and the shared formulas."""
