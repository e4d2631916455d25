"""The LSTM of the paper's Table 5 ablation."""
