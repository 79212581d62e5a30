"""Examples of training your own Keras model with towerps (README: "Train your own model")."""
