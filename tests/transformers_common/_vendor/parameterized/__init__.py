from .parameterized import parameterized, param, parameterized_class

__version__ = "0.9.0"
