"""Where the retry policy and containment used to be: they are `consumers.runtime.retry` and
`consumers.runtime.containment`. `worker/exactly_once.py` still imports `is_outage` from here; once it imports
it from `consumers.runtime.retry`, this module goes. Nothing else imports it.
"""

from consumers.runtime.retry import is_outage

__all__ = ["is_outage"]
