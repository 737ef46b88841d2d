"""batchspec: batch offline generation over Parquet with speculative decoding on vLLM."""

__version__ = "0.1.0"
