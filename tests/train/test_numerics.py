"""Switches that must not change the numbers (torchtitan's "proof of value"): per-application
activation checkpointing, and the loss chunk size, reproduce the same loss curve (fp32, CPU)."""

from __future__ import annotations

from lt2dsl.train import run

from .helpers import config


def test_checkpointing_and_loss_chunks_leave_the_losses_unchanged(tmp_path):
    plain = run(config(tmp_path, "plain", training={"steps": 3}))
    ac = run(config(tmp_path, "ac", training={"steps": 3, "activation_checkpoint": "per_application"}))
    chunked = run(config(tmp_path, "chunked", training={"steps": 3, "loss_chunk": 7}))
    assert ac.losses == plain.losses
    for s, v in plain.losses.items():
        assert abs(chunked.losses[s] - v) < 1e-5  # chunked sums add in another order
    assert plain.losses[3] < plain.losses[1]
