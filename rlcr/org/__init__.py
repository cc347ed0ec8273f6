"""The organisation: agents of one shared policy working as a company on one task.

protocol.py (the action language and its parser), board.py, workspace.py, episode.py (the round
scheduler and the policy interface), records.py (the episode record schema), scripted.py
(hand-written organisations used as oracles and for bootstrap traces).
"""

from rlcr.org.episode import Generation, Policy, Request, approx_tokens, run_episodes
from rlcr.org.protocol import Action, ParsedTurn, parse_turn, render_action
from rlcr.org.records import EpisodeRecord, from_frames, read_parquet, to_frames, write_parquet
from rlcr.org.scripted import ScriptedOrg

__all__ = [
    "Action",
    "EpisodeRecord",
    "Generation",
    "ParsedTurn",
    "Policy",
    "Request",
    "ScriptedOrg",
    "approx_tokens",
    "from_frames",
    "parse_turn",
    "read_parquet",
    "render_action",
    "run_episodes",
    "to_frames",
    "write_parquet",
]
