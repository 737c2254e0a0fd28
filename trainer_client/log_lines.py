"""Where a long job stands, said in plain lines when its console writes to a file.

rich draws a progress bar only when it stops if the console is not a terminal (a `nohup ... > log` run, CI), so an
hour of SFT or evaluation would leave the log silent. LogLines says the same status as a line instead, at most once
every `every_s` seconds, and nothing on a terminal, where the bar shows it.
"""

from __future__ import annotations

import time

from rich.console import Console


class LogLines:
    def __init__(self, console: Console, every_s: float = 60.0) -> None:
        self.console, self.every_s = console, every_s
        self.said_at: float | None = None

    def say(self, text: str, last: bool = False) -> bool:
        """Print `text` if the console is a file and `every_s` has passed since the last line (or `last`)."""
        if self.console.is_terminal:
            return False
        now = time.monotonic()
        if not last and self.said_at is not None and now - self.said_at < self.every_s:
            return False
        self.console.print(text, markup=False, highlight=False)
        self.said_at = now
        return True
