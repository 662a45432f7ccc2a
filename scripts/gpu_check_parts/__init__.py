"""The parts of scripts/gpu_check.py (its entry point): definitions, the steps' commands
and key figures, running a step, reporting, the environment record."""
