"""nsqadmin: the web UI and its JSON API (spec §5).

``python -m nsqpy.nsqadmin --lookupd-http-address=127.0.0.1:4161`` (or the ``nsqadmin``
console script) serves it; :class:`~nsqpy.nsqadmin.nsqadmin.NSQAdmin` embeds it.
"""
