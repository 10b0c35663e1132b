package queue

// RaiseFence raises the fence of partition id in its log, as a new
// owner taking the partition over at epoch would, while this manager
// still serves it with its own epoch.
func RaiseFence(m *Manager, id PartitionID, epoch uint64) error {
	p, err := m.partition(id)
	if err != nil {
		return err
	}
	return p.log.Fence(epoch)
}
