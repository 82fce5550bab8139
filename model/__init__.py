from model.boxnet import BoxNet
from model.build import build_model, forget_kept_model, kept_model

__all__ = ["BoxNet", "build_model", "forget_kept_model", "kept_model"]
