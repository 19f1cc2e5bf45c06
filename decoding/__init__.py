"""DecodeScope engine: step-wise decoding strategies that emit typed traces.

Never imports streamlit, plotly or pandas.
"""
from decoding.errors import ConfigError

__all__ = ["ConfigError"]
