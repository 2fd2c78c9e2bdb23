"""`python -m agenthost`: the same as the `agenthost` command."""

import sys

from agenthost.launch import main

sys.exit(main())
