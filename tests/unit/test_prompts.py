"""Prompt building and action parsing, on hand-written cases."""

import pytest

from trainer_client.prompts import (
    ParsedAction, PastTurn, PromptConfig, build_prompt, expert_reply, format_penalty, is_listed, listed_actions, parse_action,
    turn_penalty, webshop_view,
)


def test_parse_valid_reply_lowercases_and_strips():
    assert parse_action("<think>the mug is here</think><action> Take Mug 1 from Desk 1 </action>") == ParsedAction(
        "take mug 1 from desk 1", True
    )


def test_parse_takes_first_action_block():
    assert parse_action("<think>x</think><action>look</action><action>inventory</action>").action == "look"


def test_missing_think_is_invalid_unless_not_required():
    reply = "<action>look</action>"
    assert parse_action(reply) == ParsedAction("look", False)
    assert parse_action(reply, PromptConfig(require_think=False)) == ParsedAction("look", True)


def test_missing_action_tags_is_invalid_and_passes_a_short_tail():
    parsed = parse_action("<think>hmm</think> I would go to the fridge " + "x" * 100)
    assert not parsed.valid and len(parsed.action) == 40


def test_cjk_characters_make_a_reply_invalid():
    assert not parse_action("<think>去冰箱</think><action>go to fridge 1</action>").valid


def test_penalty_only_on_invalid():
    cfg = PromptConfig(format_penalty=0.25)
    assert format_penalty(ParsedAction("look", True), cfg) == 0.0
    assert format_penalty(ParsedAction("look", False), cfg) == 0.25


def test_unlisted_penalty_adds_to_the_format_penalty_and_is_off_by_default():
    listed = ["go to desk 1", "Take Mug 1 from Desk 1", "look"]
    cfg = PromptConfig(format_penalty=0.25, unlisted_penalty=0.5)
    assert turn_penalty(ParsedAction("take mug 1 from desk 1", True), listed, cfg) == 0.0
    assert turn_penalty(ParsedAction("go to shelf 1", True), listed, cfg) == 0.5
    assert turn_penalty(ParsedAction("go to shelf 1", False), listed, cfg) == 0.75
    assert turn_penalty(ParsedAction("go to shelf 1", True), listed) == 0.0


def test_a_listed_template_lists_every_filled_in_action():
    # WebShop's start page lists `search[<your query>]`: a typed search is on the list, an empty one is not.
    listed = ["search[<your query>]", "click[s000000583]"]
    assert is_listed("search[red running shoes under 40 dollars]", listed)
    assert is_listed("Click[S000000583]", listed)
    assert not is_listed("search[ ]", listed) and not is_listed("search[]", listed)
    assert not is_listed("click[s000000584]", listed) and not is_listed("click[<your query>]", listed)
    assert not is_listed("search[shoes]", ["click[search]"])
    cfg = PromptConfig(unlisted_penalty=0.5)
    assert turn_penalty(ParsedAction("search[red shoes]", True), listed, cfg) == 0.0
    assert turn_penalty(ParsedAction("click[s000000584]", True), listed, cfg) == 0.5


def test_expert_reply_round_trips():
    assert parse_action(expert_reply("go to fridge 1")) == ParsedAction("go to fridge 1", True)


def test_prompt_shows_only_last_k_turns_with_step_numbers():
    history = [PastTurn(f"obs {i}", f"act {i}") for i in range(5)]
    prompt = build_prompt("alfworld", "heat some egg", "You see a microwave 1.", ["go to microwave 1", "look"],
                          history, step=5)
    assert "[Step 4] observation: obs 3 | action: act 3" in prompt
    assert "[Step 5] observation: obs 4 | action: act 4" in prompt
    assert "obs 2" not in prompt
    assert "You have taken 5 step(s) so far" in prompt
    assert "You are now at step 6. Current observation: You see a microwave 1." in prompt
    assert "Admissible actions: ['go to microwave 1', 'look']" in prompt
    assert prompt.startswith("You are an expert agent acting in ALFWorld") and "Your task is to: heat some egg." in prompt


def test_listed_actions_reads_back_the_list_a_prompt_rendered():
    alfworld = ["go to bed 1", "go to desk 1", "take cd 1 from drawer 1"]
    prompt = build_prompt("alfworld", "look at laptop under the desklamp", "You open the drawer 1.", alfworld,
                          [PastTurn("You arrive at drawer 1.", "open drawer 1")], 1)
    assert listed_actions(prompt) == alfworld
    webshop = ["search[red shoes]", "click[b0123]", "click[buy now]"]
    assert listed_actions(build_prompt("webshop", "red shoes", "Search", webshop, [], 0)) == webshop
    assert listed_actions("no list here") == []


def test_first_step_has_no_history_block():
    prompt = build_prompt("toy", "go to the attic", "You are in the hall.", ["go to attic"], [], step=0)
    assert "so far" not in prompt and "You are now at step 1." in prompt


def test_history_observations_can_be_shortened():
    history = [PastTurn("one two three four five six", "look")]
    prompt = build_prompt("toy", "t", "o", [], history, step=1, cfg=PromptConfig(history_obs_max_words=3))
    assert "observation: one two three ... | action: look" in prompt


def test_webshop_view_drops_the_instruction_and_quotes_parts():
    obs = "Instruction: [SEP] find a red mug [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next >"
    assert webshop_view(obs, "find a red mug") == "'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] 'Next >'"
    done = "Thank you for shopping with us! [SEP] Your code: [SEP] None"
    assert webshop_view(done, "find a red mug") == done


def test_a_compact_webshop_prompt_reads_ids_as_the_actions_that_click_them():
    obs = ("Instruction: [SEP] find a red mug [SEP] Back to Search [SEP] Next > [SEP] S0001 [SEP] Red Mug [SEP] $3.0")
    actions = ["click[back to search]", "click[next >]", "click[s0001]"]
    prompt = build_prompt("webshop", "find a red mug", obs, actions, [PastTurn("Search", "search[red mug]")], 1,
                          PromptConfig(compact=True))
    assert prompt.splitlines() == [
        "Task: find a red mug.",
        "[1] search => search[red mug]",
        "Now: back to search | next > | s0001 | red mug | $3.0",
        "Admissible actions: ['click[back to search]', 'click[next >]', 'click[s0001]']",
    ]
    assert listed_actions(prompt) == actions
    assert webshop_view("Thank you for shopping with us! [SEP] Your code:", "find a red mug", compact=True) == \
        "thank you for shopping with us! | your code:"


def test_a_compact_prompt_keeps_what_changes_and_drops_the_fixed_wording():
    history = [PastTurn(f"obs {i} with more words", f"act {i}") for i in range(5)]
    actions = ["go to microwave 1", "look"]
    args = ("alfworld", "heat some egg", "You see a microwave 1.", actions, history)
    compact = build_prompt(*args, step=5, cfg=PromptConfig(history_turns=2, history_obs_max_words=2, compact=True))
    assert compact.splitlines() == [
        "Task: heat some egg.",
        "[4] obs 3 ... => act 3",
        "[5] obs 4 ... => act 4",
        "Now: You see a microwave 1.",
        "Admissible actions: ['go to microwave 1', 'look']",
    ]
    assert listed_actions(compact) == actions
    assert listed_actions(f"<|im_start|>user\n{compact}<|im_end|>\n<|im_start|>assistant\n") == actions
    anchor = build_prompt(*args, step=5, cfg=PromptConfig(history_turns=2, history_obs_max_words=2))
    assert len(compact) < 0.6 * len(anchor)
    first = build_prompt("toy", "go to the attic", "You are in the hall.", ["go to attic"], [], 0,
                         PromptConfig(compact=True))
    assert first == "Task: go to the attic.\nNow: You are in the hall.\nAdmissible actions: ['go to attic']"


def test_a_compact_prompt_refuses_a_worked_example():
    with pytest.raises(ValueError, match="compact"):
        PromptConfig(compact=True, example="Task: ...")
