"""Group advantages: hand-computed values, exact zeros for flat groups, refusal of bad rewards."""

import math

import pytest
import torch

from rlcr.advantage import group_advantages, role_group_ids, token_advantages


def test_one_group_std_normalised_by_hand():
    # mean 0.5, centred +-0.5, unbiased var = (4 * 0.25) / 3 = 1/3, std = 0.57735
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([7, 7, 7, 7]))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert adv.tolist() == pytest.approx([expected, -expected, expected, -expected], rel=1e-6)
    assert adv.dtype == torch.float32


def test_mean_only_when_std_off():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), [0, 0, 0, 0], std_normalise=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_groups_do_not_mix_and_keys_may_be_strings():
    # group a: [1, 0] -> +-0.5 / std(=sqrt(0.5)); group b: [0.3, 0.9] -> -+0.3 / std(=sqrt(0.18))
    adv = group_advantages(torch.tensor([1.0, 0.3, 0.0, 0.9]), ["a", "b", "a", "b"])
    a, b = 0.5 / (math.sqrt(0.5) + 1e-6), 0.3 / (math.sqrt(0.18) + 1e-6)
    assert adv.tolist() == pytest.approx([a, -b, -a, b], rel=1e-5)


def test_equal_rewards_give_exactly_zero_not_float_noise():
    # 0.1 * 3 / 3 != 0.1 in floating point: a naive (R - mean) / (std + eps) gives ~1e-11, not 0
    r = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    naive = (r - r.mean()) / (r.std() + 1e-6)
    assert (naive != 0).any()  # the trap is real
    adv = group_advantages(r, [0, 0, 0])
    assert adv.tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(adv).all()


def test_flat_group_is_zero_while_other_group_learns():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.2, 0.2, 0.2]), [0, 0, 1, 1, 1])
    assert adv[2:].tolist() == [0.0, 0.0, 0.0]
    assert adv[0].item() == pytest.approx(1 / math.sqrt(2), rel=1e-5)


def test_group_of_one_has_no_baseline():
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0]), [0, 0, 1])
    assert adv[2].item() == 0.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_reward_refused_with_its_index(bad):
    with pytest.raises(ValueError, match="index 2"):
        group_advantages(torch.tensor([1.0, 0.0, bad, 0.5]), [0, 0, 0, 0])


def test_length_mismatch_refused():
    with pytest.raises(ValueError, match="group_ids has 2"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), [0, 0])


def test_per_role_groups_separate_roles_of_the_same_task():
    roles = ["ceo", "worker", "ceo", "worker"]
    gid = role_group_ids([0, 0, 0, 0], roles)
    assert gid.tolist() == [0, 1, 0, 1]
    adv = group_advantages(torch.tensor([1.0, 0.5, 0.0, 0.5]), gid)
    # ceo: [1, 0] -> +-1/sqrt(2); worker: [0.5, 0.5] -> exactly 0
    assert adv.tolist() == pytest.approx([1 / math.sqrt(2), 0.0, -1 / math.sqrt(2), 0.0], rel=1e-5)
    assert adv[1].item() == 0.0


def test_token_advantages_padded_layout_zero_on_observations():
    adv = torch.tensor([0.5, -2.0])
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    out = token_advantages(adv, loss_mask=mask)
    assert out.tolist() == [[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, -2.0, -2.0]]


def test_token_advantages_packed_layout_and_episode_to_turns():
    adv = torch.tensor([1.5, -1.0, 0.0])  # per episode
    turn_episode = torch.tensor([0, 0, 2, 1])  # 4 agent turns: two in episode 0
    assert token_advantages(adv, token_sample=turn_episode).tolist() == [1.5, 1.5, 0.0, -1.0]
    with pytest.raises(ValueError, match="outside"):
        token_advantages(adv, token_sample=torch.tensor([3]))
    with pytest.raises(ValueError, match="exactly one"):
        token_advantages(adv)
