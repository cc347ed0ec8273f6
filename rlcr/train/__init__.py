"""Training: the policy-gradient loss and NaN guard (loss), atomic resumable checkpoints
(checkpoint), and supervised bootstrap on scripted traces (sft)."""
