"""Variable shapes of real models, for tests that need no TensorFlow."""

# The classic CIFAR-10 tutorial CNN (workers/models.py `cifar10_cnn`):
# 1,068,298 float32 parameters, 4,273,192 bytes; local3/kernel alone is 83%.
CIFAR10_CNN = {
    "conv1/kernel": (5, 5, 3, 64), "conv1/bias": (64,),
    "conv2/kernel": (5, 5, 64, 64), "conv2/bias": (64,),
    "local3/kernel": (2304, 384), "local3/bias": (384,),
    "local4/kernel": (384, 192), "local4/bias": (192,),
    "softmax/kernel": (192, 10), "softmax/bias": (10,),
}
