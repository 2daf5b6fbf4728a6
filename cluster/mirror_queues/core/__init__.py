"""The pure core of mirrored queues: replicas with LEO, HW, ISR and leader epochs, and the controller's election."""
