"""Offline (batch) RL from Timeline output: datasets, training with CPE every epoch, the workflow."""
