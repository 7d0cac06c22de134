"""elastic-step: elastic, fault-tolerant TensorFlow 2 training in one pipeline step."""

__version__ = "0.1.0"
