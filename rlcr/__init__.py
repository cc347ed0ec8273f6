"""RLCR: Reinforcement Learning from Collective Rewards.

One shared policy plays a CEO and the specialists it hires; they share a message board and a
workspace, and every agent is paid the same reward for the company's verified outcome.
"""

__version__ = "0.1.0"
