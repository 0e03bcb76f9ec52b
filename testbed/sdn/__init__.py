"""The Ryu controller: its launcher and its REST client (the app itself is ``controllers/testbed_controller.py``).
"""
