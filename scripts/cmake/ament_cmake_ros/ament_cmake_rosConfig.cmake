# A build-only stand-in for ament_cmake_ros, used by scripts/setup_tf2.sh to build upstream tf2 against the pip ROS 2
# wheels. ament_cmake_ros is ament_cmake + ament_cmake_ros_core (BUILD_SHARED_LIBS default, ROS_PACKAGE_NAME) + the
# isolated-test helpers; the helpers need the gtest/gmock vendor packages, which are not wheels, and tf2 is built with
# BUILD_TESTING=OFF, so this provides the first two only (both are wheels in the venv).
set(ament_cmake_ros_VERSION "0.14.5")
find_package(ament_cmake REQUIRED)
find_package(ament_cmake_ros_core REQUIRED)
set(ament_cmake_ros_FOUND TRUE)
set(ament_cmake_ros_FOUND_AMENT_PACKAGE TRUE)
