//! Pure functions: result documents + policy -> findings and per-node verdicts. No I/O.
