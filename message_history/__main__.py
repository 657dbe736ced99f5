"""`python -m message_history` is the same as the `message-history` console script."""

import sys

from message_history.app.cli import main

sys.exit(main())
