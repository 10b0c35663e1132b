package bench

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
)

// TestBenchBufferedConnKeepsConcurrentPacketsWhole writes two-part packets
// (header, body) as net.Buffers from several goroutines through a
// bufferedConn, as paho does, and checks the other end reads every packet
// whole: written part by part, packets of two goroutines interleave.
func TestBenchBufferedConnKeepsConcurrentPacketsWhole(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const writers, packets, size = 8, 500, 64
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		buf := make([]byte, 1+size)
		for i := 0; i < writers*packets; i++ {
			if _, err := io.ReadFull(r, buf); err != nil {
				got <- err
				return
			}
			if want := bytes.Repeat(buf[:1], size); !bytes.Equal(buf[1:], want) {
				got <- io.ErrUnexpectedEOF
				return
			}
		}
		got <- nil
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn := bufferedConn{TCPConn: raw.(*net.TCPConn), r: bufio.NewReader(raw)}
	defer conn.Close()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := byte('a' + w)
			for range packets {
				b := net.Buffers{[]byte{id}, bytes.Repeat([]byte{id}, size)}
				if _, err := b.WriteTo(conn); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := <-got; err != nil {
		t.Fatalf("packets were not read whole: %v", err)
	}
}
