"""The Gradio web app's tabs (Arena, Eval sets, Dashboard) and its charts. `app.py` assembles them."""
from .arena import Arena  # noqa: F401
from .dashboard import Dashboard  # noqa: F401
from .evalsets_tab import EvalSetsTab  # noqa: F401
