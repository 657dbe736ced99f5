"""Where the retry policy and containment used to be: they are `consumers.runtime.retry` and
`consumers.runtime.containment`. The names the worker SDK (`worker/runner.py`) imports from here stay
importable until it imports them from there; nothing else does.
"""

from consumers.runtime.retry import backoff_delay, is_outage

__all__ = ["backoff_delay", "is_outage"]
