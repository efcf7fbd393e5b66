"""The frozen bundle's entry point: the same `kvdesk` command the venv installs.

It holds no logic of its own (a bundle must behave exactly like `pip install kvdesk`); what
only a frozen app needs is set up before this runs, in `rthook_kvdesk.py`.
"""

from desktop_app.cli import run

run()
