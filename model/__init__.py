from model.boxnet import BoxNet

__all__ = ["BoxNet"]
