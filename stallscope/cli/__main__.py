"""``python -m stallscope.cli ...``: the same as the ``stallscope`` command."""

import sys

from stallscope.cli import main

sys.exit(main())
