"""A long job run into a log file says where it stands in plain lines (rich draws its bar there only at the end)."""

from __future__ import annotations

import io

import torch
from policy_fixtures import micro_checkpoint, turn_samples  # noqa: F401  (fixtures)
from rich.console import Console

from trainer_client.log_lines import LogLines
from trainer_client.policy import Policy
from trainer_client.sft import sft


def file_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_a_file_gets_a_line_at_most_every_interval_and_always_the_last():
    console, out = file_console()
    lines = LogLines(console, every_s=3600)
    said = [lines.say("step 1"), lines.say("step 2"), lines.say("step 3", last=True)]
    assert said == [True, False, True]
    assert out.getvalue().splitlines() == ["step 1", "step 3"]


def test_every_line_is_said_with_no_interval_and_none_on_a_terminal():
    console, out = file_console()
    lines = LogLines(console, every_s=0)
    for i in range(3):
        lines.say(f"iteration {i} [not markup]")
    assert out.getvalue().splitlines() == [f"iteration {i} [not markup]" for i in range(3)]
    shown = io.StringIO()
    terminal = LogLines(Console(file=shown, force_terminal=True), every_s=0)
    assert not terminal.say("drawn by the bar instead", last=True) and shown.getvalue() == ""


def test_sft_into_a_log_file_ends_with_its_last_step(micro_checkpoint):
    torch.manual_seed(0)
    policy = Policy.load(micro_checkpoint)
    console, out = file_console()
    losses = sft(policy, turn_samples(policy, 8), epochs=1, lr=1e-3, batch_turns=4, console=console)
    said = [line for line in out.getvalue().splitlines() if line.startswith("SFT step")]
    assert said[0].startswith("SFT step 1/2: loss ") and said[-1] == f"SFT step 2/2: loss {losses[-1]:.3f}"
