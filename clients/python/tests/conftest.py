import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    # The installed package when there is one (CI tests the wheel)...
    import hermes_gateway  # noqa: F401
except ImportError:
    # ...else the one in this checkout.
    sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
# LiteLLM fetches a model price map from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
