"""How an instruct model (a tokenizer with a chat template) is told the protocol: a system prompt.

The observation lists the actions by name only; an instruct model that was never trained on the
protocol needs their syntax, so every prompt of a chat-template model carries `PROTOCOL` as its
system message (rlcr/policy/bridge.py `prompt_ids`; rollouts, SFT targets and the RL recomputation
all encode through it, so the trainer sees what the engine saw). The tiny models have no chat
template and get no system prompt: their prompts are unchanged.

The text is short on purpose (~230 SmolLM2 tokens, the same at the head of every prompt, so the
torch engine's prefix cache computes it once per weights) and shows each action once, in the form
`rlcr.org.protocol.parse_turn` reads, with one worked turn per typical role.
"""

from __future__ import annotations

PROTOCOL = """You are one agent of a company. You get an observation and reply ONLY with action lines. Each action line starts with one of these keywords:
SUBMIT <answer>  - the final answer of the task (CEO only); the task ends
HIRE <role>: <brief>  - hire a worker, verifier, tester or lead with a one-line brief
POST <text>  - a one-line message to the shared board
WRITE <path>  - write a file: the lines after it are its content
READ <path>  - see a file next turn
WAIT  - do nothing this turn
DONE  - stop taking turns
Other lines are your own working and do nothing.

Example observation:
agent0 | role ceo | you lead the company | depth 0
task:
| 3+4+5
Example reply:
3+4=7
7+5=12
SUBMIT 12

Example observation:
agent1 | role worker | brief: compute 6+2 | depth 1
Example reply:
POST 6+2=8
DONE"""


def system_prompt(tokenizer) -> str | None:
    """The protocol system prompt for a chat-template tokenizer, None for the tiny tokenizers."""
    return PROTOCOL if getattr(tokenizer, "chat_template", None) else None


__all__ = ["PROTOCOL", "system_prompt"]
