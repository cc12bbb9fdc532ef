"""Our Flower ClientApp (an ordinary app on the fl_gradcode.flower plug-in)."""
