"""A small Flower app (numpy logistic regression) that records wall-clock timestamps.

``T_MODULE``: when this package was first imported, i.e. before ``client_app`` imports anything
(Flower imports ``breakdown_app.client_app``, which runs this file first): the ClientApp's
"module start" stamp.
"""

import time

T_MODULE = time.time()
